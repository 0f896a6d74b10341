"""The coordinator service, one sub-package per concern, each importing only those below it.

From the top: `app` wires the service together; `http` is the API, the dashboard and the HTTP server;
`config_sources` reads the settings from options, a file and the environment; `model` is the global
model's torch side; `round` is the round loop and the uploads it waits on; `config` holds the typed
settings; `fleet` the devices' enrolment; `broker` the MQTT side; `strategies` the methods, pure maths;
`privacy` secure summation and the privacy budget; `state` the database and files that outlive a
restart; `refusals` why an upload is refused. The import linter holds this order (pyproject.toml).
"""
