"""The data layer's error: a source that cannot be read."""


class SourceError(ValueError):
    """A data source is missing, unreadable, empty or unreachable; the message says the fix."""
