"""Why the coordinator refuses an upload; the API answers each with its HTTP status."""


class UploadRefused(Exception):
    """An upload the coordinator does not take; the text says why."""


class BadUpload(UploadRefused):
    """An upload that is malformed or does not fit the model: the sender has to change it."""


class NotWanted(UploadRefused):
    """A well-formed upload that is not wanted now: late, for another task, or one too many."""
