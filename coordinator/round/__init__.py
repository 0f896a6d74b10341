"""The round loop: the orchestrator picks devices, hands them tasks, waits on `Uploads` for what comes in,
has the strategy aggregate, and makes the new model durable. How a round trains (in parallel, buffered,
chained or summed securely) is a mode in `modes`; what the loop needs from outside (the devices' link,
the model's operations) is named in `interfaces`, so that it runs on fakes in tests.
"""
