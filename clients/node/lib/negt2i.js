'use strict';
/**
 * A small Node.js client of the NegT2IBench orchestrator (`negt2i.v1.Evaluator`), written from the
 * published protos and docs/api.md only: nothing here is generated from, or depends on, the Python code.
 *
 *   const { EvaluatorClient, promptSpec } = require('./lib/negt2i');
 *   const client = new EvaluatorClient('127.0.0.1:50051');
 *   await client.waitReady(30000);
 *   const res = await client.evaluate({ request_id: 'a', prompt: promptSpec(record), image: { data: png } });
 *   console.log(res.verdict.correct, res.verdict.reason);
 *
 * Messages are plain objects with the protos' field names (snake_case), enums as their names
 * ("CATEGORY_COLOR"), 64-bit integers as strings, unset scalars as their defaults, an unset message as
 * null, and for every `oneof` a property naming the member that is set (`statement.kind === 'relation'`).
 *
 * Protos: from the include root `protos/` of the repository (or of the protos artefact `make
 * protos-dist` builds; option `protoRoot` or NEGT2I_PROTOS): `negt2i/v1/evaluator.proto` and the
 * standard protos shipped beside it, `grpc/health/v1/health.proto`, `google/rpc/status.proto` and
 * `google/rpc/error_details.proto` (docs/api.md, "Getting the protos").
 */

const fs = require('node:fs');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const protobuf = require('protobufjs');

/** The repository's include root (the directory holding `negt2i/v1/`). */
const REPO_PROTOS = path.resolve(__dirname, '..', '..', '..', 'protos');

const FILES = [
  'negt2i/v1/evaluator.proto',
  'grpc/health/v1/health.proto',
  'google/rpc/status.proto',
  'google/rpc/error_details.proto',
];

/** How messages look on the JavaScript side (see the header comment). */
const OBJECT_OPTIONS = { keepCase: true, longs: String, enums: String, defaults: true, oneofs: true };

/** The health service name of the whole evaluator (docs/api.md lists the others). */
const HEALTH_SERVICE = 'negt2i.v1.Evaluator';

/** Largest message received or sent by default: the orchestrator's default limit, 32 MiB. */
const DEFAULT_MAX_MESSAGE_BYTES = 32 * 1024 * 1024;

/** Initial metadata key of EvaluateStream carrying the flow-control window (items in flight). */
const WINDOW_KEY = 'negt2i-max-in-flight';

/** Trailer holding the serialized google.rpc.Status of a failed call (the gRPC rich error model). */
const STATUS_DETAILS_KEY = 'grpc-status-details-bin';

/** google.rpc.Code numbers to names (ItemError.code and Status.code are these numbers). */
const CODE_NAMES = Object.fromEntries(Object.entries(grpc.status).map(([name, n]) => [n, name]));

const _apis = new Map();

/**
 * Load the protos once per include root: `{ Evaluator, Health, root }` (service constructors of
 * grpc-js, and a protobufjs Root to encode/decode any message of the loaded files).
 */
function loadApi(protoRoot = process.env.NEGT2I_PROTOS || REPO_PROTOS) {
  const key = path.resolve(protoRoot);
  if (_apis.has(key)) return _apis.get(key);
  const missing = FILES.filter((f) => !fs.existsSync(path.join(key, f)));
  if (missing.length) {
    throw new Error(`${key}: no ${missing.join(', ')}; point protoRoot (or NEGT2I_PROTOS) at the protos' include root`);
  }
  const includeDirs = [key];
  const definition = protoLoader.loadSync(FILES, { ...OBJECT_OPTIONS, includeDirs });
  const loaded = grpc.loadPackageDefinition(definition);
  const root = new protobuf.Root();
  root.resolvePath = (origin, target) => {
    const candidate = path.join(key, target);
    return fs.existsSync(candidate) ? candidate : protobuf.util.path.resolve(origin, target);
  };
  root.loadSync(FILES, { keepCase: true });
  root.resolveAll();
  const api = { Evaluator: loaded.negt2i.v1.Evaluator, Health: loaded.grpc.health.v1.Health, root };
  _apis.set(key, api);
  return api;
}

/** A message of type `name` (e.g. "google.rpc.BadRequest") decoded from bytes into a plain object. */
function decodeMessage(root, name, bytes) {
  const type = root.lookupType(name);
  return type.toObject(type.decode(bytes), OBJECT_OPTIONS);
}

/** A google.protobuf.Any (`{type_url, value}`) unpacked as the proto3 JSON mapping does:
 * `{'@type': type_url, ...fields}` (`value` in base64 when its type is not in the loaded protos). */
function unpackAny(root, any) {
  const typeUrl = String(any.type_url || '');
  try {
    return { '@type': typeUrl, ...decodeMessage(root, typeUrl.split('/').pop(), any.value) };
  } catch {
    return { '@type': typeUrl, value: Buffer.from(any.value || []).toString('base64') };
  }
}

/** The error's google.rpc.ErrorInfo and google.rpc.BadRequest, flattened: `reason`, `stage`,
 * `field` (the BadRequest's field path, else ErrorInfo's metadata) and `metadata`. */
function summarize(details) {
  const info = details.find((d) => d['@type'].endsWith('/google.rpc.ErrorInfo')) || { metadata: {} };
  const bad = details.find((d) => d['@type'].endsWith('/google.rpc.BadRequest'));
  const violation = bad && bad.field_violations.length ? bad.field_violations[0] : null;
  return {
    reason: info.reason || '',
    stage: info.metadata.stage || '',
    field: violation ? violation.field : info.metadata.field || '',
    metadata: info.metadata,
  };
}

/**
 * The rich error of a failed call (docs/api.md, "Errors and status codes"), from the google.rpc.Status
 * in its `grpc-status-details-bin` trailer: `{ code, code_name, message, details, reason, stage, field,
 * metadata }`, `details` the Status's details unpacked (`[{ '@type': 'type.googleapis.com/google.rpc.
 * ErrorInfo', reason, domain, metadata }, { '@type': '...google.rpc.BadRequest', field_violations }]`)
 * and the last four read from them. Without the trailer (an error gRPC itself produced) `details` is
 * empty and `code` / `message` are the call's status and details text.
 */
function errorDetails(err, root = loadApi().root) {
  let status = { code: err.code, message: err.details || '', details: [] };
  const raw = err.metadata && err.metadata.get(STATUS_DETAILS_KEY);
  if (raw && raw.length) {
    const decoded = decodeMessage(root, 'google.rpc.Status', raw[0]);
    status = { code: decoded.code, message: decoded.message, details: decoded.details.map((any) => unpackAny(root, any)) };
  }
  return { ...status, code_name: CODE_NAMES[status.code] || String(status.code), ...summarize(status.details) };
}

/** An ItemError of the stream: its fields, `code_name`, its `status` (google.rpc.Status) with the
 * details unpacked, and `reason` / `metadata` read from the status's ErrorInfo. */
function itemError(error, root = loadApi().root) {
  const details = error.status ? error.status.details.map((any) => unpackAny(root, any)) : [];
  const { reason, metadata } = summarize(details);
  return {
    ...error,
    code_name: CODE_NAMES[error.code] || String(error.code),
    status: error.status ? { ...error.status, details } : null,
    reason,
    metadata,
  };
}

// --------------------------------------------------------------------------- prompt records

/** Record keys that have a PromptSpec field (or, for GenEval's include[].color / .position, a mapping). */
const RECORD_KEYS = new Set([
  'id', 'prompt', 'category', 'tag', 'setting', 'include', 'exclude', 'statements', 'probes', 'source_id', 'form',
  'same_text_as',
]);

function statementSpec(st) {
  // a record without a polarity means positive (the wire refuses POLARITY_UNSPECIFIED)
  const polarity = `POLARITY_${String(st.polarity || 'positive').toUpperCase()}`;
  if (st.kind === 'attribute') {
    return { polarity, attribute: { object: st.object || 0, value: st.value } };
  }
  if (st.kind === 'relation') {
    return { polarity, relation: { subject: st.subject || 0, target: st.target || 0, predicate: st.predicate } };
  }
  throw new Error(`statement kind must be "attribute" or "relation", got ${JSON.stringify(st.kind)}`);
}

/**
 * A PromptSpec from a prompt record (a line of the corpus JSONL or of a GenEval `metadata.jsonl`),
 * key by key as docs/api.md's table says: `include` -> `objects` (`class` -> `class_name`; `count`
 * left unset when absent, which the server reads as 1; GenEval's `color` / `position` become positive
 * statements, first), `exclude` -> `exclude`, statement `kind` -> the `attribute` / `relation` member,
 * `polarity` -> POLARITY_* (absent: positive), `category` -> CATEGORY_* (absent: GenEval's color /
 * position entries make it color / directional, else the server takes the tag's), `tag` and
 * `setting` left empty when absent (the server defaults them); every other key goes, verbatim,
 * into `extra_json`.
 */
function promptSpec(record) {
  const statements = [];
  let inferred = null;
  const objectSpec = (entry) => ({ class_name: entry.class, count: entry.count === undefined ? 0 : entry.count });
  const objects = (record.include || []).map((entry, i) => {
    if (entry.color !== undefined) {
      inferred = 'color';
      statements.push({ kind: 'attribute', object: i, value: entry.color, polarity: 'positive' });
    }
    if (entry.position !== undefined) {
      inferred = 'directional';
      statements.push({ kind: 'relation', subject: i, target: entry.position[1], predicate: entry.position[0], polarity: 'positive' });
    }
    return objectSpec(entry);
  });
  statements.push(...(record.statements || []));
  const category = record.category || inferred;
  const extra = {};
  for (const key of Object.keys(record).sort()) {
    if (!RECORD_KEYS.has(key)) extra[key] = record[key];
  }
  return {
    id: String(record.id),
    prompt: record.prompt,
    category: category ? `CATEGORY_${String(category).toUpperCase()}` : 'CATEGORY_UNSPECIFIED',
    tag: record.tag || '',
    setting: record.setting || '',
    objects,
    exclude: (record.exclude || []).map(objectSpec),
    statements: statements.map(statementSpec),
    probes: (record.probes || []).map(statementSpec),
    source_id: record.source_id || '',
    form: record.form || '',
    same_text_as: record.same_text_as || '',
    extra_json: Object.keys(extra).length ? JSON.stringify(extra) : '',
  };
}

/** The media type of encoded image bytes by their signature (a hint only: the server sniffs anyway). */
function mediaType(data) {
  if (data.subarray(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]))) return 'image/png';
  if (data[0] === 0xff && data[1] === 0xd8) return 'image/jpeg';
  if (data.subarray(0, 4).toString('latin1') === 'RIFF' && data.subarray(8, 12).toString('latin1') === 'WEBP') return 'image/webp';
  return '';
}

/** The JSON strings of a verdict (`*_json`) parsed: each object and statement gets `measurements`. */
function readVerdict(verdict) {
  const parse = (text) => (text ? JSON.parse(text) : {});
  const withMeasurements = (x) => ({ ...x, measurements: parse(x.measurements_json) });
  return {
    ...verdict,
    config: parse(verdict.config_json),
    objects: verdict.objects.map(withMeasurements),
    statements: verdict.statements.map(withMeasurements),
    probes: verdict.probes.map(withMeasurements),
  };
}

// --------------------------------------------------------------------------- the client

class EvaluatorClient {
  /**
   * @param {string} target HOST:PORT of the orchestrator.
   * @param {object} [options]
   * @param {string} [options.protoRoot] include root of the protos (default: the repository's protos/).
   * @param {grpc.ChannelCredentials} [options.credentials] default: insecure (plaintext).
   * @param {string} [options.token] bearer token sent as `authorization` (default: NEGT2I_TOKEN).
   * @param {number} [options.maxMessageBytes] largest message sent or received (default 32 MiB).
   */
  constructor(target, options = {}) {
    this.api = loadApi(options.protoRoot);
    const credentials = options.credentials || grpc.credentials.createInsecure();
    const max = options.maxMessageBytes || DEFAULT_MAX_MESSAGE_BYTES;
    const channelOptions = { 'grpc.max_receive_message_length': max, 'grpc.max_send_message_length': max };
    this.evaluator = new this.api.Evaluator(target, credentials, channelOptions);
    this.healthStub = new this.api.Health(target, credentials, { channelOverride: this.evaluator.getChannel() });
    this.metadata = new grpc.Metadata();
    const token = options.token === undefined ? process.env.NEGT2I_TOKEN || '' : options.token;
    if (token) this.metadata.set('authorization', `Bearer ${token}`);
  }

  close() {
    this.evaluator.close();
  }

  _unary(stub, method, request, timeoutMs) {
    const callOptions = timeoutMs ? { deadline: new Date(Date.now() + timeoutMs) } : {};
    return new Promise((resolve, reject) => {
      stub[method](request, this.metadata, callOptions, (err, response) => (err ? reject(err) : resolve(response)));
    });
  }

  /** The health status name of `service` ("SERVING", "NOT_SERVING", ...). */
  async health(service = HEALTH_SERVICE, timeoutMs = 5000) {
    const response = await this._unary(this.healthStub, 'Check', { service }, timeoutMs);
    return response.status;
  }

  /** Poll health until SERVING (true) or `timeoutMs` passed (false). */
  async waitReady(timeoutMs = 60000, intervalMs = 250) {
    const end = Date.now() + timeoutMs;
    while (Date.now() < end) {
      try {
        if ((await this.health(HEALTH_SERVICE, Math.max(100, Math.min(5000, end - Date.now())))) === 'SERVING') return true;
      } catch {
        // not up yet
      }
      await new Promise((r) => setTimeout(r, intervalMs));
    }
    return false;
  }

  /** GetServiceInfo: versions, stage models, limits, the rule config, the vocabulary. */
  info(timeoutMs = 30000) {
    return this._unary(this.evaluator, 'GetServiceInfo', {}, timeoutMs);
  }

  /** GetVocabulary: classes, categories with their values / predicates, settings, the case rule. */
  vocabulary(timeoutMs = 30000) {
    return this._unary(this.evaluator, 'GetVocabulary', {}, timeoutMs);
  }

  /**
   * Evaluate: judge one image. `request` is an EvaluateRequest object:
   * `{ request_id, prompt: PromptSpec | prompt_id: string, image: { data: Buffer }, include_perception }`.
   * Rejects with the grpc-js error; `errorDetails(err)` reads its structured details.
   */
  evaluate(request, timeoutMs = 300000) {
    return this._unary(this.evaluator, 'Evaluate', request, timeoutMs);
  }

  /**
   * EvaluateStream with the server's flow-control window honoured: `requests` (any iterable or async
   * iterable of EvaluateRequest objects) are sent no more than `window` unanswered at a time, where
   * `window` is the grant of the initial metadata `negt2i-max-in-flight` (or `options.window` if
   * smaller). Yields every EvaluateStreamResponse as it arrives (completion order; match them by
   * request_id, which must be unique within the stream). `onWindow(n)` is called with the grant,
   * `onSend(inFlight)` after each request written with the number now unanswered.
   */
  async *stream(requests, options = {}) {
    const callOptions = options.timeoutMs ? { deadline: new Date(Date.now() + options.timeoutMs) } : {};
    const call = this.evaluator.EvaluateStream(this.metadata, callOptions);
    const queue = [];
    let wake = null;
    const notify = () => {
      if (wake) {
        const w = wake;
        wake = null;
        w();
      }
    };
    const push = (event) => {
      queue.push(event);
      notify();
    };
    call.on('metadata', (md) => push({ metadata: md }));
    call.on('data', (response) => push({ response }));
    call.on('error', (error) => push({ error }));
    call.on('end', () => push({ end: true }));
    const next = async () => {
      while (!queue.length) await new Promise((r) => (wake = r));
      return queue.shift();
    };
    const iterator = (requests[Symbol.asyncIterator] || requests[Symbol.iterator]).call(requests);
    let window = null;
    let inFlight = 0;
    let sent = 0;
    let exhausted = false;
    const fill = async () => {
      while (!exhausted && inFlight < window) {
        const item = await iterator.next();
        if (item.done) {
          exhausted = true;
          call.end();
          return;
        }
        inFlight += 1;
        sent += 1;
        call.write(item.value);
        if (options.onSend) options.onSend(inFlight);
      }
    };
    try {
      for (;;) {
        const event = await next();
        if (event.metadata) {
          const grant = Number(event.metadata.get(WINDOW_KEY)[0] || 1);
          window = Math.max(1, Math.min(grant, options.window || grant));
          if (options.onWindow) options.onWindow(grant);
          await fill();
        } else if (event.response) {
          inFlight -= 1;
          yield event.response;
          await fill();
        } else if (event.error) {
          throw event.error;
        } else if (event.end) {
          if (inFlight > 0) throw new Error(`the stream ended with ${inFlight} of ${sent} items unanswered`);
          return;
        }
      }
    } finally {
      if (!exhausted || inFlight > 0) call.cancel();
    }
  }
}

module.exports = {
  CODE_NAMES,
  DEFAULT_MAX_MESSAGE_BYTES,
  EvaluatorClient,
  HEALTH_SERVICE,
  REPO_PROTOS,
  WINDOW_KEY,
  errorDetails,
  itemError,
  loadApi,
  mediaType,
  promptSpec,
  readVerdict,
  unpackAny,
};
