-- defines: pack_list unpack_list
-- A list of strings as one string: each '>I4' length-prefixed (hand-off entries, call replies).
local function pack_list(values)
  local parts = {}
  for i, v in ipairs(values) do parts[i] = struct.pack('>I4', string.len(v)) .. v end
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
