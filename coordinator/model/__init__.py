"""The global model's torch side on the coordinator: its initial and grown weights, held-out evaluation
and ONNX export (`global_model`), and the first model made before round 1 (`pretraining`).
"""
