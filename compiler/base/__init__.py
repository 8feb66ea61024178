"""Base: takes nothing from the other stages; gives dtypes and their numpy mapping, the typed errors that name what
a user must fix, and the Target record (what code is generated for, and its host fingerprint)."""
