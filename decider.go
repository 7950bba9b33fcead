package jobkey

// decider is what a job's decisions need of its Queue: the queue's name,
// its config and its keys. A decision takes the read and Redis's time
// beside it, and builds its writes into a plan; it sends nothing to Redis
// and changes nothing outside that plan, so it is tested without Redis.
// The Queue embeds it.
type decider struct {
	name string
	cfg  Config
	ks   *keyspace
}
