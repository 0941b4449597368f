// graphile-worker 0.18 running a no-op task: the PostgreSQL job-queue peer,
// measured the way `peer-bench queue-leash` measures leash.
//
//   node peer.mjs drain <url> <jobs> <workers>
//     enqueue <jobs> no-op jobs (addJobs, batches of 1,000), then start a
//     runner and time it until every job is complete; prints
//     {"jobs_per_s": ...} as the last line.
//   node peer.mjs latency <url> <rate> <seconds> <workers>
//     enqueue jobs (addJob) at <rate> per second, each at its own time
//     whether or not the ones before it have answered, while a runner
//     works; prints the enqueue→start latencies in microseconds.
//
// Settings: concurrency <workers>, maxPoolSize <workers> + 2 (its docs'
// advice), LISTEN/NOTIFY wake-ups (always on), completion unbatched
// (completeJobBatchDelay -1, the default), no local queue (the default), a
// 50 ms poll interval as leash's fallback poll.
import { performance } from "node:perf_hooks";
import { Logger, makeWorkerUtils, run } from "graphile-worker";

const [mode, url, ...rest] = process.argv.slice(2);
// Its per-job log lines would cost it time leash does not spend.
const quiet = { logger: new Logger(() => () => {}) };

function options(workers, taskList) {
  return {
    connectionString: url,
    concurrency: workers,
    maxPoolSize: workers + 2,
    pollInterval: 50,
    noHandleSignals: true,
    taskList,
    ...quiet,
  };
}

async function drain(jobs, workers) {
  const utils = await makeWorkerUtils({ connectionString: url, ...quiet });
  await utils.migrate();
  const enqueue = performance.now();
  for (let done = 0; done < jobs; done += 1000) {
    const n = Math.min(1000, jobs - done);
    await utils.addJobs(Array.from({ length: n }, () => ({ identifier: "noop", payload: {} })));
  }
  const enqueueSeconds = (performance.now() - enqueue) / 1000;
  await utils.release();
  let complete = 0;
  let finished;
  const all = new Promise((resolve) => (finished = resolve));
  const start = performance.now();
  const runner = await run(options(workers, { noop: async () => {} }));
  runner.events.on("job:complete", () => {
    complete += 1;
    if (complete === jobs) finished();
  });
  await all;
  const seconds = (performance.now() - start) / 1000;
  await runner.stop();
  console.log(JSON.stringify({ jobs, seconds, jobs_per_s: jobs / seconds, enqueue_per_s: jobs / enqueueSeconds }));
}

async function latency(rate, seconds, workers) {
  const jobs = Math.floor(rate * seconds);
  const utils = await makeWorkerUtils({ connectionString: url, ...quiet });
  await utils.migrate();
  const latencies = [];
  let finished;
  const all = new Promise((resolve) => (finished = resolve));
  const runner = await run(
    options(workers, {
      noop: async (payload) => {
        latencies.push(Math.round((performance.now() - payload.sent) * 1000));
        if (latencies.length === jobs) finished();
      },
    }),
  );
  const gap = 1000 / rate;
  const begin = performance.now();
  // Open loop: each add starts at its own time, whether or not the ones
  // before it have answered.
  const adds = [];
  for (let i = 0; i < jobs; i++) {
    const due = begin + i * gap;
    const wait = due - performance.now();
    if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
    adds.push(utils.addJob("noop", { sent: performance.now() }));
  }
  await Promise.all(adds);
  const submittedPerS = jobs / ((performance.now() - begin) / 1000);
  await all;
  await runner.stop();
  await utils.release();
  console.log(JSON.stringify({ latencies_us: latencies, submitted_per_s: submittedPerS }));
}

const numbers = rest.map(Number);
if (mode === "drain") await drain(numbers[0], numbers[1]);
else if (mode === "latency") await latency(numbers[0], numbers[1], numbers[2]);
else {
  console.error("usage: node peer.mjs drain <url> <jobs> <workers> | latency <url> <rate> <seconds> <workers>");
  process.exit(2);
}
