"""Measurements of models: FLOP counts (:mod:`.flops`), what an attention block attends to
(:mod:`.attention_scores`) and where a backbone's train step spends its time (:mod:`.step_profile`). Import the
module you need."""
