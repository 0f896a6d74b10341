"""The coordinator's HTTP face: the devices' routes and the operator's (one blueprint), the OpenAPI
description, the dashboard and its data, Prometheus metrics, the admin token's checks, and the server that
reads each request whole, within its deadline and body budget, before a worker handles it. Nothing here
runs a round: handlers hand uploads to the round package and read the state.
"""
