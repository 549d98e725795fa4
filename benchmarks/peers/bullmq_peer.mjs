// BullMQ's driver for the peers benchmark, with BullMQ's defaults. Same protocol, command line and job
// sequence as the Python drivers (python_peer.py has the description; keep the two in step).
//
// - enqueue: `await queue.add('job', {i, due}, {delay})` per job; bulk: `await queue.addBulk([...])`.
// - consumer: `new Worker(name, async job => ..., {connection})` with every default: concurrency 1,
//   drainDelay 5 s, lockDuration 30 s, stalledInterval 30 s; the worker itself promotes delayed jobs.
//   Jobs are kept after completion (removeOnComplete is off by default).
//
// bullmq is loaded from $PEERS_NODE_DIR (installed there by envs.py), not from a node_modules of the
// repository.

import { createRequire } from 'node:module';
import { writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';

const require = createRequire(`${process.env.PEERS_NODE_DIR}/package.json`);
const { Queue, Worker } = require('bullmq');
const bullmqVersion = require('bullmq/package.json').version;

const GOLDEN = 0.6180339887498949;
const GRACE_MS = 1000;

const { values: opt } = parseArgs({
  options: {
    'redis-url': { type: 'string' },
    name: { type: 'string', default: 'peers' },
    role: { type: 'string' },
    scenario: { type: 'string' },
    total: { type: 'string' },
    'delay-min-ms': { type: 'string', default: '1000' },
    'delay-max-ms': { type: 'string', default: '1000' },
    mode: { type: 'string', default: 'single' },
    'in-flight': { type: 'string', default: '64' },
    batch: { type: 'string', default: '1000' },
    'bound-s': { type: 'string' },
    out: { type: 'string' },
  },
});

const total = Number(opt.total);
const lo = Number(opt['delay-min-ms']);
const hi = Number(opt['delay-max-ms']);
const url = new URL(opt['redis-url']);
const connection = {
  host: url.hostname,
  port: Number(url.port || 6379),
  db: Number((url.pathname || '/0').slice(1) || 0),
};
const info = { bullmq: bullmqVersion, node: process.version };

// Wall clock in epoch ms with sub-ms resolution (Date.now() is whole ms).
const nowMs = () => performance.timeOrigin + performance.now();
// Same sequence as python_peer.delay_ms: uniform over [lo, hi] ms.
const delayMs = (i) => lo + Math.trunc(((i * GOLDEN) % 1) * (hi - lo + 1));

function write(result) {
  writeFileSync(opt.out, JSON.stringify(result));
}

async function produce() {
  const queue = new Queue(opt.name, { connection });
  const failed = [];
  const errors = [];
  let lastDue = 0;
  const t0 = performance.now();
  if (opt.mode === 'bulk') {
    const size = Number(opt.batch);
    for (let start = 0; start < total; start += size) {
      const base = nowMs();
      const jobs = [];
      for (let i = start; i < Math.min(total, start + size); i++) {
        const d = delayMs(i);
        lastDue = Math.max(lastDue, base + d);
        jobs.push({ name: 'job', data: { i, due: base + d }, opts: { delay: d } });
      }
      try {
        await queue.addBulk(jobs);
      } catch (err) {
        for (const j of jobs) failed.push(j.data.i);
        errors.push(String(err));
      }
    }
  } else {
    let next = 0;
    const caller = async () => {
      while (next < total) {
        const i = next++;
        const d = delayMs(i);
        const due = nowMs() + d;
        lastDue = Math.max(lastDue, due);
        try {
          await queue.add('job', { i, due }, { delay: d });
        } catch (err) {
          failed.push(i);
          errors.push(String(err));
        }
      }
    };
    await Promise.all(Array.from({ length: Number(opt['in-flight']) }, caller));
  }
  const seconds = (performance.now() - t0) / 1000;
  const ok = total - failed.length;
  await queue.close();
  write({
    enqueued: ok, failed: failed.length, failed_ids: failed.slice(0, 100), errors: errors.slice(0, 5),
    seconds, rate: seconds > 0 ? ok / seconds : null, last_due_ms: lastDue, mode: opt.mode, ...info,
  });
}

async function consume() {
  const seen = new Set();
  const lateMs = [];
  let duplicates = 0;
  let outOfRange = 0;
  let tFirst = null;
  let tLast = null;
  let deadline = null;
  let stopped = '';
  let onChange = () => {};
  const setDeadline = (ms) => {
    deadline = deadline === null ? ms : Math.min(deadline, ms);
    onChange();
  };

  const tStart = nowMs();
  if (opt['bound-s'] !== undefined) setDeadline(tStart + Number(opt['bound-s']) * 1000);
  const worker = new Worker(opt.name, async (job) => {
    const now = nowMs();
    const { i, due } = job.data;
    if (!(i >= 0 && i < total)) {
      outOfRange++;
      return;
    }
    if (seen.has(i)) {
      duplicates++;
      return;
    }
    seen.add(i);
    lateMs.push(now - due);
    if (tFirst === null) tFirst = now;
    tLast = now;
    if (seen.size >= total) onChange();
  }, { connection });
  worker.on('error', (err) => process.stderr.write(`worker error: ${err}\n`));
  await worker.waitUntilReady();
  process.stdout.write('ready\n');

  let buffer = '';
  process.stdin.setEncoding('utf8');
  process.stdin.on('data', (chunk) => {
    buffer += chunk;
    let nl;
    while ((nl = buffer.indexOf('\n')) >= 0) {
      const parts = buffer.slice(0, nl).trim().split(/\s+/);
      buffer = buffer.slice(nl + 1);
      if (parts.length === 2 && parts[0] === 'deadline') setDeadline(Number(parts[1]));
    }
  });

  // Until every job arrived (then GRACE_MS more, for duplicates) or the deadline passed.
  await new Promise((resolve) => {
    let timer = null;
    onChange = () => {
      if (timer !== null) clearTimeout(timer);
      if (seen.size >= total) {
        stopped = 'all';
        onChange = () => {};
        setTimeout(resolve, GRACE_MS);
        return;
      }
      if (deadline !== null) {
        timer = setTimeout(() => {
          stopped = 'deadline';
          onChange = () => {};
          resolve();
        }, Math.max(0, deadline - nowMs()));
      }
    };
    onChange();
  });
  process.stdin.pause();
  await worker.close();
  write({
    received: seen.size, duplicates, out_of_range: outOfRange, late_ms: lateMs, t_start_ms: tStart,
    t_first_ms: tFirst, t_last_ms: tLast, deadline_ms: deadline, stopped, ...info,
  });
}

if (opt.role === 'producer') await produce();
else await consume();
process.exit(0);
