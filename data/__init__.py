"""Training and evaluation data: corpora, tokenised and packed datasets, and data regenerated in
the target's own words."""
