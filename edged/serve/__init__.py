"""Serving, in the order a request meets it: the socket loop, dispatch, admission,
the lanes (queue, batches, workers, watchdog), answering, and the figures kept on the way.
"""
