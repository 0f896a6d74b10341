"""The emulated fleet: fleet files, CPU limits and the network in front of each device.

fleet_files: the shipped *.toml fleets (FLEETS_DIR), reading and checking them; cpu_limits: running a
process at a share of one core (cgroup quota or duty cycle); network_proxy: the delaying, pacing TCP
proxy; launch: starting a fleet's device daemons behind their limits.
"""
