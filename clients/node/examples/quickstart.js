'use strict';
// The Node.js quickstart of docs/api.md: one image with Evaluate, then a folder through EvaluateStream.
//   node examples/quickstart.js 127.0.0.1:50051 /tmp/demo
// (/tmp/demo: `.venv/bin/python -m negt2i.stages.demo_data /tmp/demo`, a GenEval-layout folder.)
const fs = require('node:fs');
const path = require('node:path');
const { EvaluatorClient, errorDetails, itemError, promptSpec, readVerdict } = require('../lib/negt2i');

async function main(target, folder) {
  const client = new EvaluatorClient(target);
  if (!(await client.waitReady(30000))) throw new Error(`${target} is not SERVING`);
  const info = await client.info();
  console.log(`${info.api_version}: orchestrator ${info.orchestrator_version}, rules ${info.rules_name}`);

  // One image: a prompt record (a metadata.jsonl line) becomes a PromptSpec.
  const record = JSON.parse(fs.readFileSync(path.join(folder, '00000', 'metadata.jsonl'), 'utf8').split('\n')[0]);
  const image = fs.readFileSync(path.join(folder, '00000', 'samples', '0000.png'));
  const res = await client.evaluate({ request_id: 'one', prompt: promptSpec(record), image: { data: image } });
  const verdict = readVerdict(res.verdict);
  console.log(`one: correct=${verdict.correct} reason=${JSON.stringify(verdict.reason)}`);
  for (const s of verdict.statements) console.log(`  ${s.text}: passed=${s.passed} measured=${JSON.stringify(s.measurements)}`);

  // A bad request: INVALID_ARGUMENT; the google.rpc.Status in the trailer names the reason and the field.
  try {
    await client.evaluate({ request_id: 'bad', prompt: promptSpec(record), image: { data: Buffer.from('not an image') } });
  } catch (err) {
    const e = errorDetails(err);
    console.log(`bad: ${e.code_name} (${e.reason}) at ${e.field}: ${e.message}`);
  }

  // A folder: a generator of requests; the client keeps at most the server's window in flight
  // and answers come in completion order, matched by request_id.
  async function* requests() {
    for (const dir of fs.readdirSync(folder).sort()) {
      const meta = path.join(folder, dir, 'metadata.jsonl');
      if (!fs.existsSync(meta)) continue;
      const prompt = promptSpec(JSON.parse(fs.readFileSync(meta, 'utf8').split('\n')[0]));
      for (const name of fs.readdirSync(path.join(folder, dir, 'samples')).sort()) {
        const data = fs.readFileSync(path.join(folder, dir, 'samples', name));
        yield { request_id: `${dir}/samples/${name}`, prompt, image: { data } };
      }
    }
  }
  let correct = 0;
  let total = 0;
  for await (const answer of client.stream(requests(), { onWindow: (n) => console.log(`window: ${n}`) })) {
    total += 1;
    if (answer.outcome === 'result') correct += answer.result.verdict.correct ? 1 : 0;
    else console.log(`${answer.request_id}: ${itemError(answer.error).reason}: ${answer.error.message}`);
  }
  console.log(`stream: ${correct}/${total} correct`);
  client.close();
}

main(process.argv[2] || '127.0.0.1:50051', process.argv[3] || '/tmp/demo').catch((err) => {
  console.error(err);
  process.exitCode = 1;
});
