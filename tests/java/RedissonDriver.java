// A Redisson client driven over stdin/stdout, for aiodelayq's interop tests (tests/redisson_java.py).
// One command per line, as JSON; one JSON answer per line: {"ok": true, "result": ...} or
// {"ok": false, "error": "..."}. Payloads are strings (StringCodec), as aiodelayq's "str" codec writes.
//
//   {"op": "open", "name": N}                      getDelayedQueue (starts Redisson's transfer task)
//   {"op": "offer", "name": N, "items": [..], "delay_ms": D}
//   {"op": "poll", "name": N, "timeout_ms": T}     one item or null
//   {"op": "drain", "name": N, "count": C, "timeout_ms": T}  poll until C items or T ms in all;
//                                                 [item, local epoch ms when polled] pairs
//   {"op": "size"|"readAll", "name": N}            the delayed queue's size() / readAll()
//   {"op": "contains"|"remove", "name": N, "item": X}
//   {"op": "destroy", "name": N}                   stop this client's transfer task for N
//   {"op": "shardNames", "queue": N, "shards": K}  the shards' queue names of the sharded queue N
//                                                 (shardNames below: docs/java.md shows the same code)
//   {"op": "shutdown"}
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.redisson.Redisson;
import org.redisson.api.RBlockingQueue;
import org.redisson.api.RDelayedQueue;
import org.redisson.api.RedissonClient;
import org.redisson.client.codec.StringCodec;
import org.redisson.config.Config;
import org.redisson.connection.CRC16;

public final class RedissonDriver {
    private static final ObjectMapper JSON = new ObjectMapper();

    public static void main(String[] args) throws Exception {
        // stdout carries answers only; Redisson's logging goes to stderr (slf4j-simple's default).
        PrintStream out = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        Config config = new Config();
        // Redisson's calls give up after 3 s by default, a subscription after 7.5 s: too short on a
        // loaded two-core machine with a JVM still compiling. The tests bound each answer themselves.
        int timeoutMs = 10_000;
        if (args[0].startsWith("cluster:")) {
            // cluster:redis://host:port,redis://host:port,...: every node of a Redis Cluster.
            config.useClusterServers().addNodeAddress(args[0].substring(8).split(","))
                  .setMasterConnectionMinimumIdleSize(2).setMasterConnectionPoolSize(8)
                  .setSubscriptionConnectionMinimumIdleSize(1).setSubscriptionConnectionPoolSize(4)
                  .setTimeout(timeoutMs);
        } else {
            config.useSingleServer().setAddress(args[0]).setConnectionMinimumIdleSize(2).setConnectionPoolSize(8)
                  .setSubscriptionConnectionMinimumIdleSize(1).setSubscriptionConnectionPoolSize(4)
                  .setTimeout(timeoutMs);
        }
        RedissonClient client = Redisson.create(config);
        Map<String, RDelayedQueue<String>> delayed = new HashMap<>();
        Map<String, RBlockingQueue<String>> queues = new HashMap<>();
        out.println("{\"ok\": true, \"result\": \"ready\"}");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            ObjectNode answer = JSON.createObjectNode();
            try {
                JsonNode cmd = JSON.readTree(line);
                String op = cmd.path("op").asText();
                String name = cmd.path("name").asText();
                if (op.equals("shutdown")) {
                    answer.put("ok", true);
                    out.println(JSON.writeValueAsString(answer));
                    break;
                }
                if (!name.isEmpty() && !delayed.containsKey(name) && !op.equals("destroy")) {
                    RBlockingQueue<String> q = client.getBlockingQueue(name, StringCodec.INSTANCE);
                    queues.put(name, q);
                    delayed.put(name, client.getDelayedQueue(q));
                }
                RBlockingQueue<String> q = queues.get(name);
                RDelayedQueue<String> d = delayed.get(name);
                Object result = null;
                switch (op) {
                    case "open":
                        result = true;
                        break;
                    case "offer":
                        long delayMs = cmd.path("delay_ms").asLong();
                        for (JsonNode item : cmd.path("items")) {
                            d.offer(item.asText(), delayMs, TimeUnit.MILLISECONDS);
                        }
                        result = cmd.path("items").size();
                        break;
                    case "poll":
                        result = q.poll(cmd.path("timeout_ms").asLong(), TimeUnit.MILLISECONDS);
                        break;
                    case "drain": {
                        int count = cmd.path("count").asInt();
                        long deadline = System.nanoTime() + cmd.path("timeout_ms").asLong() * 1_000_000L;
                        List<List<Object>> got = new ArrayList<>();
                        while (got.size() < count) {
                            long left = (deadline - System.nanoTime()) / 1_000_000L;
                            if (left <= 0) {
                                break;
                            }
                            String item = q.poll(Math.min(left, 200), TimeUnit.MILLISECONDS);
                            if (item != null) {
                                got.add(List.of(item, System.currentTimeMillis()));
                            }
                        }
                        result = got;
                        break;
                    }
                    case "size":
                        result = d.size();
                        break;
                    case "readAll":
                        result = d.readAll();
                        break;
                    case "contains":
                        result = d.contains(cmd.path("item").asText());
                        break;
                    case "remove":
                        result = d.remove(cmd.path("item").asText());
                        break;
                    case "shardNames":
                        result = shardNames(cmd.path("queue").asText(), cmd.path("shards").asInt());
                        break;
                    case "destroy":
                        if (d != null) {
                            d.destroy();
                            delayed.remove(name);
                            queues.remove(name);
                        }
                        result = d != null;
                        break;
                    default:
                        throw new IllegalArgumentException("unknown op " + op);
                }
                answer.put("ok", true);
                answer.set("result", JSON.valueToTree(result));
            } catch (Exception e) {
                answer.put("ok", false);
                answer.put("error", e.toString());
            }
            out.println(JSON.writeValueAsString(answer));
        }
        client.shutdown();
    }

    // The queue names of the shards of aiodelayq's sharded queue `name` (shards=K): shard i is
    // "{name~n}:i", n the least integer whose tag's slot lies in the middle half of the i-th of K
    // equal ranges of the 16384 slots.
    static List<String> shardNames(String name, int shards) {
        String[] names = new String[shards];
        int missing = shards;
        for (long salt = 0; missing > 0; salt++) {
            String tag = name + "~" + salt;
            long scaled = (long) (CRC16.crc16(tag.getBytes(StandardCharsets.UTF_8)) % 16384) * shards;
            int index = (int) (scaled / 16384);
            long offset = scaled % 16384;
            if (offset >= 4096 && offset < 12288 && names[index] == null) {
                names[index] = "{" + tag + "}:" + index;
                missing--;
            }
        }
        return Arrays.asList(names);
    }
}
