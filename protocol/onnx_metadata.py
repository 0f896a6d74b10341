"""The metadata keys of an exported ONNX model, all string values: written at export, read where it runs."""

MODEL = "model"  # architecture name, e.g. "cnn"
LABELS = "labels"  # JSON list of class names, in the order of the probability columns
SAMPLE_RATE = "sample_rate"  # Hz
NUM_SAMPLES = "num_samples"  # waveform length the model takes
TASK = "task"  # name of the task learnt ("" if none was given)
ROUND = "round"  # round of the global model, absent for a model exported outside the rounds
DEPTH = "depth"  # encoder blocks of a growing model, absent for others
QUANTIZATION = "quantization"  # "int8" for a quantised copy, absent for fp32
THRESHOLD = "threshold"  # the detection threshold calibrated on held-out clips, absent without them
# on which clips the threshold was calibrated, or why the model has none, in words a listener logs
THRESHOLD_FROM = "threshold_from"

REQUIRED = (LABELS, SAMPLE_RATE, NUM_SAMPLES)  # what a runtime needs to feed the model and name its outputs
