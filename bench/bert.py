"""all-MiniLM-L6-v2 sentence embeddings on tppasm (see :mod:`bench.models.minilm`) against torch."""
from bench.models.minilm import MiniLM  # noqa: F401
