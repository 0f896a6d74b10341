"""Speech data shipped with fedspeech: the Free Spoken Digit Dataset (fsdd/)."""
