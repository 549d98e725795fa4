-- defines: unindex
-- uses: lib/chunked.lua lib/index.lua
-- Drop the index entries of keyed elements that are no longer pending (transferred or removed).
-- `owned`: the tags of moved fast elements with the tag bit set: such an element owns its field
-- (see the index section), dropped unread; the caller collects them in the loop where it parses
-- the elements, so a transfer walks its elements once. `checked`: strict and legacy
-- elements, with in `starts` where their tag starts (parse's third value): their ids are
-- Redisson's random bytes as often as tags, so their field is dropped only if it holds this very
-- element. Appends to `owned`.
local function unindex(K, owned, checked, starts)
  if #checked > 0 and redis.call('hlen', K.key_index) > 0 then
    for i = 1, #checked, 1000 do
      local tags = {}
      for j = i, math.min(i + 999, #checked) do
        local s = starts[j]
        tags[#tags + 1] = string.sub(checked[j], s, s + 7)
      end
      local blobs = redis.call('hmget', K.key_index, unpack(tags))
      for j, blob in ipairs(blobs) do
        if blob and index_pairs(blob)[2] == checked[i + j - 1] then owned[#owned + 1] = tags[j] end
      end
    end
  end
  chunked('hdel', K.key_index, nil, owned)
end
