"""The suite's vocabulary: data types, protocols and errors that subjects, strategies, adapters and
properties share. Imports only :mod:`reference`; holds no policy, no oracle and no library call.
"""
