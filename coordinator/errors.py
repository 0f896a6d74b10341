"""Why the coordinator refuses an upload; the API answers each with its HTTP status."""


class Refused(Exception):
    """An upload the coordinator does not take; the text says why."""


class BadUpload(Refused):
    """An upload that is malformed or does not fit the model: the sender has to change it."""


class NotWanted(Refused):
    """A well-formed upload that is not wanted now: late, for another task, or one too many."""
