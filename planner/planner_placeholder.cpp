namespace memplan {}
