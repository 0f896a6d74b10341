"""Emulated fleet files shipped with fedspeech (see fedspeech.fleet)."""
