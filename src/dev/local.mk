# Device control (hardware / software): filled in by the data path issue.
