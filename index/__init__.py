"""Gallery indexing and search over the exported ONNX embedder (LMDB storage, faiss index)."""
