"""The one artifact format of trained drafters: write it (`save_artifact`), check and load it
(`load_drafter`), and identify the target it belongs to (`target_fingerprint`).

    config.json         draftsmith_version, drafter kind, head (the kind's config), target
                        (name_or_path, architecture, vocab_size, hidden_size, num_hidden_layers,
                        fingerprint), feature_layers, draft_vocab, training
    model.safetensors   the head's own tensors (never the target's shared modules)
    calibration.json    optional, written by calibration
    README.md           model card
    acceptance_head.safetensors  optional, a learned acceptance head (config.json entry
                        acceptance_head; `draftsmith.artifact.acceptance`)

Loading validates before it trusts: the files exist, the version is readable (older formats are
upgraded on read), the kind is known and the head config fits its config class (all of which
`read_artifact_config` checks without a target), the target is the one the head was trained for
(vocabulary, then fingerprint), the tensors are intact and exactly the ones the head has, finite,
and not all still at their initialisation.

`calibrate_artifact` / `evaluate_artifact` calibrate an artifact's confidence on held-out data
(writing calibration.json) or score its calibration (`draftsmith.artifact.calibrate`).
"""

from draftsmith.artifact.files import (
    CALIBRATION_FILE,
    CONFIG_FILE,
    README_FILE,
    WEIGHTS_FILE,
    __version__,
)
from draftsmith.artifact.fingerprint import target_fingerprint
from draftsmith.artifact.load import (
    UntrainedDrafterError,
    load_acceptance_head,
    load_acceptance_model,
    load_drafter,
    load_head,
    read_artifact_config,
)
from draftsmith.artifact.save import model_card, own_tensors, save_artifact
from draftsmith.core.lazy import lazy_exports

# Calibration collects with datasets and the decoder: loaded on first use, so loading a drafter
# pays for neither.
_LAZY = {
    "ArtifactCalibration": "calibrate",
    "calibrate_artifact": "calibrate",
    "evaluate_artifact": "calibrate",
    "prepare_calibration": "calibrate",
}


__getattr__ = lazy_exports(__name__, _LAZY)


__all__ = [
    "CALIBRATION_FILE",
    "CONFIG_FILE",
    "README_FILE",
    "WEIGHTS_FILE",
    "UntrainedDrafterError",
    "__version__",
    "load_acceptance_head",
    "load_acceptance_model",
    "load_drafter",
    "load_head",
    "model_card",
    "own_tensors",
    "read_artifact_config",
    "save_artifact",
    "target_fingerprint",
    *_LAZY,
]
