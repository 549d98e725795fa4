"""What a queue looks like in Redis: its key names (``key_names``), the element formats Redisson shares
(``elements``), payload codecs (``codec``), delays (``delays``) and the estimate of the server's clock
(``clock``). Pure code: no I/O."""
