"""One episode: the prompt the agent sees (`prompt`: system part, lessons, history, admissible actions, action
parsing), the runner that steps N environment slots with one batched call per turn (`runner`), what a run's
environments and prompt builders are built from (`build`), and past won episodes shown as examples (`examples`)."""
