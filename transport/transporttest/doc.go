// Package transporttest is test support for transports: the conformance
// suite every transport adapter must pass (Run), and the discovery of real
// brokers for tests (AMQPURL, RedisURL).
package transporttest
