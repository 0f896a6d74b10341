"""ONNX export and parity checks (onnx_export, needs torch) and the torch-free inference runtime (runtime)."""
