"""The metadata keys of an exported ONNX model, all string values: written at export, read where it runs;
and the file names of a model exported as two graphs (its front-end and its classifier).
"""

from pathlib import Path

MODEL = "model"  # architecture name, e.g. "cnn"
LABELS = "labels"  # JSON list of class names, in the order of the probability columns
SAMPLE_RATE = "sample_rate"  # Hz
NUM_SAMPLES = "num_samples"  # waveform length the model takes
TASK = "task"  # name of the task learnt ("" if none was given)
ROUND = "round"  # round of the global model, absent for a model exported outside the rounds
DEPTH = "depth"  # encoder blocks of a growing model, absent for others
QUANTIZATION = "quantization"  # "int8" for a quantised copy, absent for fp32
THRESHOLD = "threshold"  # the detection threshold calibrated on held-out clips, absent without them
SAY = "say"  # JSON object: how the labels whose names do not say them are spoken (the task's `say`)
# on which clips the threshold was calibrated, or why the model has none, in words a listener logs
THRESHOLD_FROM = "threshold_from"

REQUIRED = (LABELS, SAMPLE_RATE, NUM_SAMPLES)  # what a runtime needs to feed the model and name its outputs

# A model may also travel as two graphs: the front-end (waveform samples of any length of at least FFT_SAMPLES
# -> raw log-mel frames (batch, n_mels, frames), before any per-utterance normalisation) and the classifier
# (a window's raw log-mel frames (batch, n_mels, FRAMES) -> probabilities). Both carry the one file's
# metadata, and these:
PART = "part"  # FRONTEND or CLASSIFIER; absent for the one file (waveform -> probabilities)
HOP_SAMPLES = "hop_samples"  # samples between two log-mel frames
FFT_SAMPLES = "fft_samples"  # samples one frame reads (the FFT's length)
FRAMES = "frames"  # log-mel frames of one window of NUM_SAMPLES
N_MELS = "n_mels"  # mel bands per frame
FRONTEND, CLASSIFIER = "frontend", "classifier"
PAIR_REQUIRED = (PART, HOP_SAMPLES, FFT_SAMPLES, FRAMES, N_MELS)
# what must be the same in the two graphs of a pair and their one file: they are one model
SHARED = (MODEL, LABELS, SAMPLE_RATE, NUM_SAMPLES, TASK, SAY, ROUND, DEPTH, THRESHOLD, THRESHOLD_FROM)


def pair_paths(path: Path) -> tuple[Path, Path]:
    """The two graphs exported beside the one file path: <stem>.frontend.onnx and <stem>.classifier.onnx."""
    path = Path(path)
    return path.with_name(f"{path.stem}.{FRONTEND}.onnx"), path.with_name(f"{path.stem}.{CLASSIFIER}.onnx")
