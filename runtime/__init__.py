"""The device's torch-free runtime: the ONNX model session, the streaming detector and its speech gate, audio
from a file or the microphone, the follower of announced models, the listening loop and the rule of which
announcement is newest.

numpy and onnxruntime only, never torch (a contract of pyproject.toml): what `fedspeech listen` runs on.
"""
