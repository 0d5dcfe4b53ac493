#!/usr/bin/env node
'use strict';
/**
 * negt2i-node: the Node.js client's command line (clients/node/README.md).
 *
 *   node bin/negt2i-node.js [--target HOST:PORT] health [SERVICE]
 *   node bin/negt2i-node.js [--target HOST:PORT] info
 *   node bin/negt2i-node.js [--target HOST:PORT] vocabulary
 *   node bin/negt2i-node.js [--target HOST:PORT] evaluate IMAGE (--metadata RECORD.json | --prompt-id ID)
 *   node bin/negt2i-node.js [--target HOST:PORT] stream (FOLDER | REQUESTS.jsonl) [--window N] [--repeat K]
 *
 * Output is JSON on stdout: `health` prints the status name, `info` the ServiceInfo, `vocabulary` the
 * Vocabulary, `evaluate` the EvaluateResponse (verdict with its measurements parsed) or, when the call
 * fails, `{"error": ...}` with the structured details (exit status 1). `stream` prints one line per answered image, in completion
 * order: `{"request_id", "verdict"}` or `{"request_id", "error"}`, after a first line `{"window": N}`
 * (the server's flow-control grant) and before a last line `{"summary": {...}}`.
 *
 * FOLDER is a GenEval-layout folder (`NNNNN/metadata.jsonl` + `NNNNN/samples/*.png`, the request_id is
 * the image's path below FOLDER); REQUESTS.jsonl has one request per line:
 * `{"request_id": ..., "image": PATH, "metadata": {record} | "prompt_id": ID}` (paths relative to the file).
 */

const fs = require('node:fs');
const path = require('node:path');
const { parseArgs } = require('node:util');
const { EvaluatorClient, errorDetails, itemError, mediaType, promptSpec, readVerdict } = require('../lib/negt2i');

const USAGE = `usage: negt2i-node [--target HOST:PORT] [--protos DIR] [--timeout S]
         health [SERVICE] | info | vocabulary | evaluate IMAGE (--metadata FILE | --prompt-id ID) [--request-id ID] |
         stream (FOLDER | REQUESTS.jsonl) [--window N] [--repeat K]`;

function request(requestId, imagePath, source) {
  const data = fs.readFileSync(imagePath);
  const req = { request_id: requestId, image: { data, media_type: mediaType(data) } };
  if (source.prompt_id !== undefined) req.prompt_id = source.prompt_id;
  else req.prompt = promptSpec(source.metadata);
  return req;
}

/** The images of a GenEval-layout folder, in job order: `[{request_id, image, metadata}]`. */
function folderJobs(root) {
  const jobs = [];
  for (const dir of fs.readdirSync(root).sort()) {
    const meta = path.join(root, dir, 'metadata.jsonl');
    const samples = path.join(root, dir, 'samples');
    if (!fs.existsSync(meta) || !fs.existsSync(samples)) continue;
    const metadata = JSON.parse(fs.readFileSync(meta, 'utf8').split('\n').find((l) => l.trim()));
    for (const name of fs.readdirSync(samples).sort()) {
      if (!/\.(png|jpe?g|webp)$/i.test(name)) continue;
      jobs.push({ request_id: `${dir}/samples/${name}`, image: path.join(samples, name), metadata });
    }
  }
  return jobs;
}

function manifestJobs(file) {
  const base = path.dirname(file);
  return fs
    .readFileSync(file, 'utf8')
    .split('\n')
    .filter((l) => l.trim())
    .map((l) => JSON.parse(l))
    .map((job) => ({ ...job, image: path.resolve(base, job.image) }));
}

function verdictOf(response) {
  return { request_id: response.request_id, verdict: readVerdict(response.verdict), stages: response.stages };
}

async function main(argv) {
  const { values, positionals } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      target: { type: 'string', default: process.env.NEGT2I_ORCHESTRATOR || '127.0.0.1:50051' },
      protos: { type: 'string' },
      timeout: { type: 'string', default: '300' },
      metadata: { type: 'string' },
      'prompt-id': { type: 'string' },
      'request-id': { type: 'string', default: '' },
      window: { type: 'string' },
      repeat: { type: 'string', default: '1' },
      help: { type: 'boolean', short: 'h' },
    },
  });
  const [command, ...rest] = positionals;
  if (values.help || !command) {
    console.log(USAGE);
    return values.help ? 0 : 2;
  }
  const timeoutMs = Number(values.timeout) * 1000;
  const client = new EvaluatorClient(values.target, { protoRoot: values.protos });
  const print = (obj) => process.stdout.write(`${JSON.stringify(obj)}\n`);
  try {
    if (command === 'health') {
      const status = await client.health(rest[0] === undefined ? undefined : rest[0]);
      print(status);
      return status === 'SERVING' ? 0 : 1;
    }
    if (command === 'info') {
      const info = await client.info(timeoutMs);
      print({ ...info, rules: JSON.parse(info.rules_json || '{}') });
      return 0;
    }
    if (command === 'vocabulary') {
      print(await client.vocabulary(timeoutMs));
      return 0;
    }
    if (command === 'evaluate') {
      if (rest.length !== 1 || (values.metadata === undefined) === (values['prompt-id'] === undefined)) {
        console.error(USAGE);
        return 2;
      }
      const source = values.metadata !== undefined
        ? { metadata: JSON.parse(fs.readFileSync(values.metadata, 'utf8').split('\n').find((l) => l.trim())) }
        : { prompt_id: values['prompt-id'] };
      try {
        print(verdictOf(await client.evaluate(request(values['request-id'] || rest[0], rest[0], source), timeoutMs)));
        return 0;
      } catch (err) {
        if (err.code === undefined) throw err;
        print({ error: errorDetails(err, client.api.root) });
        return 1;
      }
    }
    if (command === 'stream') {
      if (rest.length !== 1) {
        console.error(USAGE);
        return 2;
      }
      const jobs = fs.statSync(rest[0]).isDirectory() ? folderJobs(rest[0]) : manifestJobs(rest[0]);
      const repeat = Number(values.repeat);
      async function* requests() {
        for (let k = 0; k < repeat; k += 1) {
          for (const job of jobs) {
            const id = repeat > 1 ? `${job.request_id}#${k}` : job.request_id;
            yield request(id, job.image, job);
          }
        }
      }
      const summary = { sent: jobs.length * repeat, verdicts: 0, errors: 0, window: null, max_in_flight: 0 };
      const options = {
        timeoutMs,
        onWindow: (n) => {
          summary.window = n;
          print({ window: n });
        },
        onSend: (n) => {
          summary.max_in_flight = Math.max(summary.max_in_flight, n);
        },
      };
      if (values.window !== undefined) options.window = Number(values.window);
      for await (const response of client.stream(requests(), options)) {
        if (response.outcome === 'result') {
          summary.verdicts += 1;
          print(verdictOf(response.result));
        } else {
          summary.errors += 1;
          print({ request_id: response.request_id, error: itemError(response.error, client.api.root) });
        }
      }
      print({ summary });
      return 0;
    }
    console.error(USAGE);
    return 2;
  } catch (err) {
    if (err.code !== undefined && err.metadata !== undefined) {
      print({ error: errorDetails(err, client.api.root) });
      console.error(`error: ${err.message}`);
      return 1;
    }
    throw err;
  } finally {
    client.close();
  }
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err) => {
    console.error(`error: ${err.stack || err}`);
    process.exitCode = 3;
  },
);
