#!/usr/bin/env node
/*
 * One gRPC call made by Node's @grpc/grpc-js, for tests that must see what a second client
 * implementation sees (SPEC §10). No .proto: the method is called by path with identity
 * serializers, so requests and responses are raw bytes (given and printed as latin1 text).
 *
 *   node grpc_node_client.js '{"target": "127.0.0.1:PORT", "path": "/test.Svc/Unary",
 *        "kind": "unary" | "stream", "request": "req", "timeout_ms": 5000 (null: none),
 *        "metadata": [["name", "value"], ...]}'
 *
 * Prints one JSON line: {"code": N, "details": "...", "messages": [...], "initial": {...},
 * "trailing": {...}, "elapsed": seconds}. A gRPC error is a result, not a failure: the exit
 * status is 0 whenever a status was received. @grpc/grpc-js is found through NODE_PATH
 * (make deps installs it under build/deps/node/node_modules). The channel's own retries are
 * off: one layer retries.
 */
'use strict';

const grpc = require('@grpc/grpc-js');

const spec = JSON.parse(process.argv[2] || '{}');
const identity = (b) => b;
const client = new grpc.Client(spec.target, grpc.credentials.createInsecure(),
	{ 'grpc.enable_retries': 0 });

const md = new grpc.Metadata();
for (const [k, v] of spec.metadata || [])
	md.add(k, v);
const options = {};
if (spec.timeout_ms !== null && spec.timeout_ms !== undefined)
	options.deadline = new Date(Date.now() + spec.timeout_ms);

/* Metadata as a plain object, repeated names joined by "," as grpcio's dicts in the tests. */
function plain(m) {
	const out = {};
	if (!m)
		return out;
	for (const [k, v] of Object.entries(m.getMap()))
		out[k] = Buffer.isBuffer(v) ? v.toString('latin1') : String(v);
	return out;
}

const t0 = process.hrtime.bigint();
const messages = [];
let initial = null;
let done = false;

function finish(status) {
	if (done)
		return;
	done = true;
	const elapsed = Number(process.hrtime.bigint() - t0) / 1e9;
	process.stdout.write(JSON.stringify({
		code: status.code, details: status.details || '', messages,
		initial: plain(initial), trailing: plain(status.metadata), elapsed,
	}) + '\n');
	client.close();
}

const req = Buffer.from(spec.request || 'req', 'latin1');
let call;
if ((spec.kind || 'unary') === 'unary') {
	call = client.makeUnaryRequest(spec.path, identity, identity, req, md, options,
		(err, value) => {
			if (!err && value)
				messages.push(value.toString('latin1'));
		});
} else {
	call = client.makeServerStreamRequest(spec.path, identity, identity, req, md, options);
	call.on('data', (b) => messages.push(b.toString('latin1')));
	call.on('error', () => {});     /* the status event carries it */
}
call.on('metadata', (m) => { initial = m; });
/* a unary call's callback runs before its status event: the status is read there */
call.on('status', (s) => setImmediate(() => finish(s)));
