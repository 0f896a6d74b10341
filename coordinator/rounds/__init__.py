"""How a round trains, by a strategy's round mode: parallel, buffered (FedBuff's) or chained (groups)."""
