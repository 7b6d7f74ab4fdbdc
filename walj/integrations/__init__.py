"""walj inside the agent frameworks: one module per framework, each an optional extra.

Promises: a tool call that runs through an integration gets exactly the journal's contract (the
intent durable before the tool runs, its outcome before the call returns, a blocked call
answered without running it). An integration talks to walj only through its public names
(`walj.ToolJournal`, `Turn.dispatch`/`adispatch`, `walj.ToolResult`, the observer hook
`walj.ToolObserver`) and never touches the log.

Never: `import walj` imports nothing from here, and nothing here imports a framework until its
module is imported; a missing framework raises an ImportError that names the extra to install.
"""
