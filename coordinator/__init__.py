"""The coordinator service, one sub-package per concern, each importing only those below it.

From the top: `app` wires the service together. Below it, side by side: `http` (the API, the dashboard,
the HTTP server), `model` (the global model's torch side) and `config_sources` (settings read from
options, a file and the environment). Then `round`, the round loop and the uploads it waits on; `config`,
the typed settings; side by side `fleet` (the devices' enrolment) and `strategies` (the methods, pure
maths); side by side `broker` (the MQTT side), `privacy` (secure summation, the privacy budget) and
`state` (what outlives a restart); at the bottom `refusals`, why an upload is refused. Modules side by
side never import each other. The import linter holds this order (pyproject.toml).
"""
