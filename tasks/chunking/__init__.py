"""DPR chunking (the library, chunker.py) and its stage family (stages.py)."""
from .chunker import DEFAULT_WORDS, chunk_document, chunk_documents

__all__ = ["DEFAULT_WORDS", "chunk_document", "chunk_documents"]
