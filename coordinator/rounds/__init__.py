"""How a round trains, by the strategy's round mode (modes.MODES): parallel (every device from the global
model), buffered (FedBuff's: late updates count in a later round, kept by the inbox's late_updates) or
chained (groups of devices one after another). Each mode is one function of the same signature
(base.RoundMode).
"""
