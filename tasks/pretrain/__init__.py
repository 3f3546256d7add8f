"""Pre-training family (paper 002): query-as-context pre-training in its coCondenser and CoT-MAE
forms and the passage-passage baseline, each a stage pretrain:NAME whose output is a base
checkpoint dense systems start from (init_from: pretrain:NAME)."""
