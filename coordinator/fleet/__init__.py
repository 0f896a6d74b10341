"""The devices as the coordinator knows them before any round: enrolment (who may register, with which
secret, and their broker credentials) and the validation clips devices chose to share.
"""
