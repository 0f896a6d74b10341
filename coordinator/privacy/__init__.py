"""What keeps a device's update from the coordinator: the coordinator's side of secure summation (the
round's arithmetic in `secure_sum_server`, its messages as they come in in `secure_sum_uploads`) and the
differential-privacy budget spent so far. The wrapper that clips and adds noise is a strategy
(`strategies.differential_privacy`).
"""
