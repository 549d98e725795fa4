"""How a command travels to Redis: one exchange on one connection (``exchange``), the bounded call
(``connections``), the cluster's answers (``cluster``), durable writes (``durability``), the resend
policy (``retry``), what the library learns once per client (``client_facts``) and the eviction check
(``eviction``)."""
