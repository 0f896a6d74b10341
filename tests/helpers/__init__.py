"""Helpers the tests share: ports, waiting, the shared corpora, device processes, ONNX files, made-up runs."""
