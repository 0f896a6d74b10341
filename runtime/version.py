"""fedspeech's own version, as installed: what a listener tells Home Assistant it runs."""

from importlib.metadata import PackageNotFoundError, version


def fedspeech_version() -> str | None:
    """The installed fedspeech's version, None if it is not installed as a distribution."""
    try:
        return version("fedspeech")
    except PackageNotFoundError:
        return None
