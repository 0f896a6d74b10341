"""The model architectures by name, and the transformer's depth: what code that never trains may know."""

# transformer variants: (pre-LayerNorm, run-time weight scaling); the last two are the ablations of
# "Federated Learning with Dynamic Transformer for Text to Speech"
TRANSFORMERS = {
    "transformer": (True, True),
    "transformer_post_ln": (False, True),
    "transformer_unscaled": (True, False),
}
# cnn_bn: BatchNorm in the conv blocks (for FedBN); emotion_cnn: a 2-D CNN that keeps loudness cues
MODELS = ["cnn", "cnn_bn", "emotion_cnn", *TRANSFORMERS]
MAX_DEPTH = 4  # encoder blocks of a full-grown transformer
# how a block added by growth starts: freshly initialised, or from the trained block below it
NEW_BLOCKS = ("fresh", "copied")
