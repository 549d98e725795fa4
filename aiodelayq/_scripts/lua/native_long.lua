-- NATIVE_LONG: the server's native unsigned long layout, for elements packed by the client.
-- KEYS: (none)
-- ARGV: (none)
-- returns: struct.pack('L', 1): the size and byte order of the server's native unsigned long
return struct.pack('L', 1)
