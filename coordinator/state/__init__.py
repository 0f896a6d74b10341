"""What outlives a restart: the SQLite database of devices, rounds, updates and evaluations (`store`,
its tables and records in `records`) and the state folder's files (model files, relays), written
atomically (`folder`).
"""
