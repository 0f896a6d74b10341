"""What needs torch or onnx: ONNX export, parity checks, quantisation (the runtime is in edge_client)."""
