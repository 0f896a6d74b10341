"""The MQTT side: the coordinator's link to the broker (tasks, announcements, the devices' presence),
the embedded broker for one-machine runs, and the users, passwords and files of the fleet's Mosquitto.
"""
