"""A tiny reference speculative-decoding engine built on attnhal's public API.

It is the worked example of how an engine uses attnhal: which backend runs each
phase comes from the registry, whether each phase is captured comes only from
:func:`attnhal.plan`, and :class:`attnhal.graphs.GraphRunner` captures and replays.
"""
