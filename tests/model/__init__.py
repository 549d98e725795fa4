"""A model-based test of the queue's public calls, where the features meet (``tests/test_model.py``
runs it; ``docs/development.md`` says how and how long).

Hypothesis draws sequences of the public calls on two ``DelayedQueue`` objects of one queue, each on
its own client behind a :class:`~tests.faults.FaultProxy`, against a private server. A call runs one
time in four after a fault on either client. After every step the queue's keys are read in one
transaction and matched with a model of what the queue must hold.

Modules, in the order a step goes through them:

* ``machine.py``: the rules (one per public call) and the check run after every step.
* ``world.py``: one example's event loop, clients, queue objects and faults; each call bracketed by
  the server's ``TIME``.
* ``model.py``: what each call may answer, and what the queue must hold after it (items as tokens
  with one state, or several alternatives while an outcome is uncertain).
* ``observe.py``: the queue's keys read at one instant and decoded; ``reconcile.py``: that
  snapshot matched with the model, token by token.
* ``state.py``: the model's vocabulary; ``known.py``: known defects the model steps around while
  someone fixes them; ``tally.py``: what a run did, for its summary.

**The calls.** ``offer`` (plain, keyed, ``replace``, ``headers``, ``expires``, ``group``,
``dedupe_for``), ``offer_many`` (keys, duplicates in one list, per-item headers, expiry and groups),
``cancel``, ``reschedule``, ``get``, ``schedule(every=)`` and ``cancel`` of a schedule's key, ``offer``
with a schedule's key (refused while the schedule is live), ``pause``/``resume``,
``set_concurrency_limit``, ``set_group_concurrency``, ``clear``, ``requeue_dead_letters``,
``purge_dead_letters``, ``take_many_with_headers``, ``receive_many``, ``ack`` (written behind, and
confirmed), ``nack`` (a delay, or ``dead_letter=True``), ``extend``, with ``max_deliveries`` of
``None``, 2 or 3, and the event stream on (``set_events``) or off. Messages are settled by the client
that received them, after any number of other steps (redelivered meanwhile, to either client, or not).

**The faults** (``world.Fault``): every connection of a client killed (its pool and pub/sub); the
reply of the next OFFER, POP, RECEIVE, SETTLE or TRANSFER of a client lost after the server applied
it; a stall of 30-300 ms; an outage of 0.7 or 1.2 s, longer than the calls' 0.5 s bound (the call
fails, ``maybe_applied``, and what the stall held lands when it ends).

**The invariants**, after every step:

* nothing lost: every item offered (or possibly offered) is found exactly where its state allows,
  and nothing is found that the model cannot explain;
* nothing delivered twice but the redeliveries the docs allow: a take hands an item out once; a
  message comes back only after its deadline or nack, with its count one higher (more only after a
  receive that met a fault: a delivery nobody saw), and an ack of a delivery no longer in flight
  says ``False``;
* nothing early: no item in the ready list or handed out before its due time, no redelivery before
  the previous deadline, no occurrence of a schedule before its grid point, nothing handed out after
  its expiry, every due time within the call's bounds plus its delay;
* ``counts()`` (pending + ready, in flight, dead letters, recurring, paused, the concurrency limit),
  ``size()`` and ``ready_size()`` equal the keys, and the keys the model;
* a receive that hands out messages under a concurrency limit leaves at most that many held (in
  flight before their deadline, not waiting out a nack's delay), unless an extend took back a message
  past its deadline since the limit was set;
* the groups' bookkeeping is what the keys hold: a field per group with items admitted (ready or in
  flight) or waiting, its messages in flight (never more than the highest group limit set), the items
  waiting in the ready list and all the groups' lists; no group has items waiting and room to admit
  them; each group's items are in due order;
* each live schedule has its record and exactly one current occurrence, pending (under its key, on
  its grid) or ready; the key index names only pending elements; the take pumps and reliable
  consumers hold nothing (prefetch, hand-off, settles) for over a round trip without a fault.
* the event stream: none while off; on, its ids in order, every message in flight has its
  ``delivered`` event and every confirmed ack its ``acked``, and there are at least as many
  ``offered``/``requeued`` events as items waiting and ``dead_lettered``/``expired`` as dead letters;
* every item due is delivered within 5 s of its due time (``drain``; 25 s when a fault left popped
  items in the hand-off, whose 20 s lease brings them back).

**Uncertain outcomes are explicit.** A call that raised with ``maybe_applied=True`` gives each item
it touched two alternatives (applied, not applied); a keyed call whose item's due time had passed
may have found it moved; a written-behind ack may not have landed (only if the library reported it
as not confirmed). The next check keeps the alternative the keys show; none fitting is a failure.
Two that fit may differ in what the keys cannot show: whether a message past its deadline was
redelivered and given back (its holder's ack, nack and extend then say False). Both are kept, and
the holder's answer picks one.

**Left out, and why.** Cron schedules (a period of at least a second, 128 listed times: too slow for
an example; ``every=`` shares their hand-out), rate limits (a token bucket on the server's clock to
model), ``peek``/``read_all``/``contains``/``remove`` (paged walks: reads to check later), workers,
``messages()`` and leases (they run their own tasks; a step cannot bracket them: they are built on
``receive``/``ack``/``nack``/``extend``, which are here), concurrent calls within a step (offer
coalescing), process deaths and server restarts (``tests/stress/``), and the configurations the
snapshot does not decode: sharded queues, tiered pending, strict and legacy elements, durable
writes, clusters, Java.

**Adding a call** is one model method and one rule:

1. ``Model.<call>(..., out: Outcome)`` in ``model.py``: check the answer (``out.result``, or
   ``out.error``) against the docs, raising :class:`~tests.model.state.Violation`, and set the
   tokens it touches (``token.set(...)``, several alternatives where the outcome is uncertain).
2. ``QueueMachine.<call>`` in ``machine.py``: ``@rule(c=CLIENT, ..., fault=FAULTS)``, which runs the
   call through ``self.step(lambda: q.<call>(...), fault)`` and hands the outcome to the model.
3. Only if the call stores something the snapshot does not read yet: ``observe.py`` decodes it and
   ``reconcile.py`` matches it.
"""
