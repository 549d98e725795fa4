-- defines: pack_list unpack_list
-- A list of strings as one string: each '>I4' length-prefixed (hand-off entries, call replies).
-- pack_list runs per popped item (POP's hand-off entry): one table.concat of prefix and value pieces,
-- each prefix packed once per length, makes no new string per value.
-- head: a string put before them (nil: none).
local function pack_list(values, head)
  local parts, prefixes, at = {head}, {}, head and 0 or -1
  for i = 1, #values do
    local v = values[i]
    local len = #v
    local prefix = prefixes[len]
    if not prefix then
      prefix = struct.pack('>I4', len)
      prefixes[len] = prefix
    end
    parts[2 * i + at] = prefix
    parts[2 * i + at + 1] = v
  end
  return table.concat(parts)
end
local function unpack_list(blob)
  local out, pos, n = {}, 1, string.len(blob)
  while pos + 3 <= n do
    local len = struct.unpack('>I4', blob, pos)
    out[#out + 1] = string.sub(blob, pos + 4, pos + 3 + len)
    pos = pos + 4 + len
  end
  return out
end
