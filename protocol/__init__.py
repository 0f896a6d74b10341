"""The wire contract shared by coordinator and devices: topics, messages, weight encoding."""
