// What the service tells the page before its first call (GET /ui/config, no token needed):
// whether auth is on (a sign-in is offered only then) and the service's own words — statuses,
// which of them are final, the reward and progress keys — so the page repeats none of them.
export const config = await (await fetch("/ui/config")).json();
export const TERMINAL = new Set(config.terminal);
