"""Asynchronous training (issue 29): the bounded-staleness buffer between rollout and update."""
