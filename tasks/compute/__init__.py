"""The compute layer below the stage families: how vectors are computed and searched, how the
cross-encoder scores, and which device computes. Library modules only (no stages): every family
that computes reads them here, so no family imports another family's stages. They import no
family (pyproject.toml's import-linter contract)."""
